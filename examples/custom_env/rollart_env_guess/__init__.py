"""Example rollart plugin: guess-the-number (see docs/plugins.md)."""
