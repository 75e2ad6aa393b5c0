"""launcher's host layer."""
