"""Making images: hashing of inputs, the deterministic layer, tar streams, bases (the real base or
its CPU twin), the builder, the env policy."""
