"""Adapters that plug ``common.attention`` into other libraries (optional extras)."""
