"""The catalogue of known GGUF models (manifest.toml): where each comes from and its checksum."""
