"""spectune's speculative-decoding inference engine (needs torch)."""
