"""Paper reproductions: the catalog (``scenarios/paper/reproductions.yaml``), the measures that turn result
tables into our numbers, the comparison table and the figures (``dropsim reproduce``, docs/reproduction.md)."""
