"""Readers and writers of checkpoint formats, one module per family, all on the canonical state."""
