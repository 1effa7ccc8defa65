"""rollart-serverless-scheme-example: a rollart serverless_scheme plugin."""
