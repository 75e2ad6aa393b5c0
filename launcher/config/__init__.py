"""launcher's config layer."""
