"""Model-specific examples: deploy gates and launch-and-measure tests built on pytest-gpuready."""
