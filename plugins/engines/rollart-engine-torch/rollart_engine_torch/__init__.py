"""rollart-engine-torch: the embedded continuous-batching inference engine."""
