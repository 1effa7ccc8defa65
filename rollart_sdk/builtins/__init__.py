"""Built-in defaults, registered through the same hooks as third-party plugins."""
