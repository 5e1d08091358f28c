"""Figures for the optimizers lessons (filled in by the lesson that introduces them)."""

__all__ = []
