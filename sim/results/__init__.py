"""Tidy result tables: their columns, incremental atomic writing, manifests, and reading them back."""
