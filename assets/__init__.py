"""Icons and export templates (package data)."""
