"""Composition: the one package that knows every concrete class (see docs/architecture.md)."""
