"""LLM-as-a-judge reward backend for rollart-sdk."""
