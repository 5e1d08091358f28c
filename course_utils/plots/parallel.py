"""Figures for the parallel lessons (filled in by the lesson that introduces them)."""

__all__ = []
