"""Op handlers, one module per op family; each registers itself with `@handler`."""
