"""A job's model in the form a static-shape compiler can take: no data-dependent control flow or shapes.

Some models branch on their data to save CPU time (the embeddings example groups passages by length and trims
padding per group). Padding changes nothing in their results, so on a static-shape device the plain computation is
the same model. Where a model is known to have such a CPU-only shortcut, or an architecture that Apple's guidance
says to rewrite for the Neural Engine, the rewrite is here, with a note that says what changed.

Resolution order:
1. the model's own `static_module()` method, if it has one (the contract for model authors: return a module with
   the same outputs for fixed-shape, padded inputs and no data-dependent control flow);
2. a rewrite registered below for the model's class;
3. the model itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class StaticForm:
    module: nn.Module
    notes: tuple[str, ...] = ()  # what was rewritten and why, for the conversion report


def _sentence_embedder(module: nn.Module) -> StaticForm:
    from farm_agent.coreml.ane_bert import MeanPooledEmbedderANE

    static = (
        "rewritten: the length grouping and per-group padding trim of MiniLMEmbedder.forward are CPU shortcuts with "
        "data-dependent shapes (argsort, nonzero); the static form embeds the whole padded batch, which gives the "
        "same vectors"
    )
    layout = (
        "rewritten per Apple's 'Deploying Transformers on the Apple Neural Engine': (B, C, 1, S) layout, "
        "Linear -> 1x1 Conv2d, attention split per head (einsum, softmax over keys on axis 1), channel-axis "
        "LayerNorm, fp16-safe -1e4 mask (farm_agent/coreml/ane_bert.py)"
    )
    return StaticForm(MeanPooledEmbedderANE(module.get_submodule("encoder")).eval(), (static, layout))


# By the model class's qualified name: the class lives in a job's code, which this package does not import.
# examples/embeddings' embedder is the one model shipped with Farm that needs a rewrite; the cleaner home for it is
# a `static_module()` method on the class itself (rule 1), after which this entry can go.
REWRITES: dict[str, Callable[[nn.Module], StaticForm]] = {
    "examples.embeddings.model.MiniLMEmbedder": _sentence_embedder,
}


def qualified_name(module: nn.Module) -> str:
    return f"{type(module).__module__}.{type(module).__qualname__}"


def static_form(module: nn.Module) -> StaticForm:
    own = getattr(module, "static_module", None)
    if callable(own):
        return StaticForm(own().eval(), (f"converted {type(module).__name__}.static_module(), its static form",))
    rewrite = REWRITES.get(qualified_name(module))
    if rewrite is not None:
        return rewrite(module)
    return StaticForm(module.eval())
