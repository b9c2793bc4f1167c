"""Writers for every output format; each takes the built model and a target folder."""
