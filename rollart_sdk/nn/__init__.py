"""Model code of the SDK's own (plain torch): :mod:`rollart_sdk.nn.llama`."""
