"""What a checkpoint is and whether a given vLLM will load it.

Holds ``ModelSpec`` and ``inspect_model`` (config.json, quantization configs, safetensors
headers, read locally or through a host in one round trip), the model checks (FP8 block
alignment, TP divisibility, MLA KV-cache backend, memory fit), the attention-backend matrix,
vLLM rule sets by version, and the deploy file.

May import: ``host`` (to read files on a GPU host, and the snapshot types the memory fit
reads) and the ground floor. Never ``serve``, ``plugin`` or pytest.
"""
