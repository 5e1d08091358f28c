"""Figures for the memory lessons (filled in by the lesson that introduces them)."""

__all__ = []
