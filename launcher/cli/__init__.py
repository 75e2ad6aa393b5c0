"""launcher's cli layer."""
