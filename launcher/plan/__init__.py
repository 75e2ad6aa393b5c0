"""launcher's plan layer."""
