"""launcher's memory layer."""
