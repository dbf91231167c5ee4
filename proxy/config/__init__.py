"""Configuration: the proxy's config file, its sections, how any config or policy file is read and checked."""
