"""Offline studies of the n-gram drafter on saved replies (no model at replay time)."""
