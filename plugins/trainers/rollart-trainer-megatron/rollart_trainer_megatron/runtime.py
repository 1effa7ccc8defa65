"""megatron-core set-up: process groups, the CPU patches, and a GPTModel from an HF config.

megatron-core 0.16 assumes CUDA in a few places that a CPU run reaches. On a CPU device
:func:`patch_for_cpu` applies these monkeypatches, and only these (each is needed, each
is checked by the plugin's tests running on CPU):

- ``torch.cuda.current_device`` returns ``"cpu"`` (Megatron passes it as ``device=`` when
  it allocates parameters, RNG states and its global memory buffer);
- ``parallel_state``'s global memory buffer allocates on the CPU;
- ``torch.cuda.synchronize`` is a no-op (the distributed checkpoint writer calls it);
- ``get_default_causal_mask`` builds the causal mask on the CPU (it hard-codes "cuda");
  the trainer passes its own packed mask anyway, this covers any other caller;
- the RNG tracker is Megatron's inference tracker (no CUDA RNG state to fork; dropout is
  off, so no randomness is drawn during training).

The model uses the local layer spec (no Transformer Engine), CPU initialisation and no
fused kernels. Megatron's pipeline schedules run under ``pipeline.CudaToCpu`` (they
allocate one counter with ``device="cuda"``); Megatron's optimizer wrapper is replaced by
distopt.py.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch
import torch.nn.functional as F

from rollart_sdk.backends.model_shape import rope_settings
from rollart_trainer_megatron.convert import Arch
from rollart_trainer_megatron.options import ROPE_SCALINGS

_PATCHED = False
# megatron-core warns at import about optional CUDA extensions this trainer never uses.
for _msg in ("Transformer Engine and Apex are not installed", "Apex is not installed",
             "full scope is deprecated"):
    warnings.filterwarnings("ignore", message=_msg, category=UserWarning)


def patch_for_cpu() -> None:
    """Make megatron-core runnable on a CPU-only process (idempotent)."""
    global _PATCHED
    if _PATCHED:
        return
    import megatron.core.fusions.fused_softmax as fused_softmax
    import megatron.core.transformer.utils as tutils
    from megatron.core import parallel_state
    from megatron.core.utils import GlobalMemoryBuffer

    cuda: Any = torch.cuda  # patched for a CPU run (torch types these functions otherwise)
    cuda.current_device = lambda: "cpu"
    # dist_checkpointing's writer synchronises CUDA before copying tensors out.
    cuda.synchronize = lambda device=None: None

    def cpu_causal_mask(sq: int) -> torch.Tensor:
        return torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1)

    tutils.get_default_causal_mask = cpu_causal_mask
    fused_softmax.get_default_causal_mask = cpu_causal_mask

    class CpuMemoryBuffer(GlobalMemoryBuffer):
        def get_tensor(self, tensor_shape: Any, dtype: Any, name: Any,
                       mem_alloc_context: Any = None) -> torch.Tensor:
            n = functools.reduce(lambda a, b: a * b, tensor_shape, 1)
            buf = self.buffer.get((name, dtype))
            if buf is None or buf.numel() < n:
                buf = self.buffer[(name, dtype)] = torch.empty(n, dtype=dtype)
            return buf[:n].view(*tensor_shape)

    parallel_state._GLOBAL_MEMORY_BUFFER = None
    original = parallel_state._set_global_memory_buffer

    def set_cpu_buffer() -> None:
        parallel_state._GLOBAL_MEMORY_BUFFER = CpuMemoryBuffer()

    parallel_state._set_global_memory_buffer = set_cpu_buffer
    parallel_state._rollart_original_set_buffer = original
    _PATCHED = True


def init_parallel(tp: int, pp: int, seed: int, cpu: bool) -> None:
    """Megatron's TP / PP / DP groups over the already initialised default group
    (idempotent for the same sizes, so a second trainer in one process reuses them)."""
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    if ps.model_parallel_is_initialized():
        have = (ps.get_tensor_model_parallel_world_size(),
                ps.get_pipeline_model_parallel_world_size())
        if have != (tp, pp):
            raise RuntimeError(
                f"megatron-core is already initialised with TP={have[0]}, PP={have[1]} in "
                f"this process; a trainer with TP={tp}, PP={pp} cannot join it"
            )
    else:
        ps.initialize_model_parallel(tensor_model_parallel_size=tp,
                                     pipeline_model_parallel_size=pp,
                                     create_gloo_process_groups=False)
    if cpu:
        tensor_parallel.random.initialize_rng_tracker(inference_rng_tracker=True,
                                                      force_reset=True)
        torch.manual_seed(seed)
    else:
        tensor_parallel.model_parallel_cuda_manual_seed(seed)


def transformer_config(hf: Any, arch: Arch, tp: int, pp: int, dtype: torch.dtype,
                       cpu: bool) -> Any:
    """A Megatron ``TransformerConfig`` equivalent to the HF Llama/Qwen config ``hf``."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    act = getattr(hf, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act {act!r} is not supported (Llama/Qwen use silu)")
    return TransformerConfig(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden,
        num_attention_heads=arch.heads,
        num_query_groups=arch.kv_heads,
        kv_channels=arch.head_dim,
        ffn_hidden_size=arch.ffn,
        normalization="RMSNorm",
        layernorm_epsilon=float(getattr(hf, "rms_norm_eps", 1e-6)),
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        use_cpu_initialization=cpu,
        perform_initialization=False,  # every weight is loaded from the HF checkpoint
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        attention_softmax_in_fp32=True,
    )


def build_gpt(hf: Any, arch: Arch, tp: int, pp: int, dtype: torch.dtype, cpu: bool,
              pre_process: bool = True, post_process: bool = True) -> Any:
    """An (uninitialised) GPTModel with the local layer spec, full logits output;
    ``pre_process`` / ``post_process``: this pipeline stage holds the embedding / the
    output layer."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    # Both transformers layouts (rope_theta / rope_scaling, or rope_parameters): reading
    # only `hf.rope_theta` gave transformers 5's configs base 10,000 whatever the model's.
    theta, kind, rope = rope_settings(hf.to_dict())
    if kind not in ROPE_SCALINGS:
        raise ValueError(f"rope_scaling type {kind!r} is not supported by trainer megatron "
                         "(supported: none, llama3)")
    if kind == "llama3" and (rope.get("low_freq_factor", 1) != 1
                             or rope.get("high_freq_factor", 4) != 4
                             or rope.get("original_max_position_embeddings", 8192) != 8192):
        raise ValueError("llama3 rope_scaling is supported with Megatron's fixed factors "
                         "(low 1, high 4, original 8192) only")
    config = transformer_config(hf, arch, tp, pp, dtype, cpu)
    spec = get_gpt_layer_local_spec(qk_layernorm=arch.qk_norm, normalization="RMSNorm")
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=arch.padded_vocab,
        max_sequence_length=int(getattr(hf, "max_position_embeddings", 4096)),
        parallel_output=False,  # full-vocabulary logits on every TP rank (the loss is shared)
        share_embeddings_and_output_weights=arch.tied,
        position_embedding_type="rope",
        rotary_base=int(theta),
        rope_scaling=kind == "llama3",
        rope_scaling_factor=float(rope.get("factor", 8.0)),
        pre_process=pre_process,
        post_process=post_process,
    )

