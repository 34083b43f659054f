"""Our own model pairs (tiny-*, bench-*): their names, where they are cached, and the
training that builds them, since nothing can be downloaded."""
