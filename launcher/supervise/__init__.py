"""launcher's supervise layer."""
