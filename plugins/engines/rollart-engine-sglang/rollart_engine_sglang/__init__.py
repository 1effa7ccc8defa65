"""Engine ``sglang`` for rollart-sdk: SGLang's in-process Engine behind InferenceEngine."""
