"""Engine ``vllm`` for rollart-sdk: vLLM's AsyncLLM behind the InferenceEngine protocol."""
