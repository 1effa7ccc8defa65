"""Built-in defaults: hookimpl modules only, registered like any third-party plugin."""
