"""One module per architecture; ``MODEL_CLASSES`` maps general.architecture to its class."""

from echoline.engine.models.base import Transformer
from echoline.engine.models.gemma3 import Gemma3Model
from echoline.engine.models.llama import LlamaModel
from echoline.engine.models.qwen2 import Qwen2Model

MODEL_CLASSES: dict[str, type[Transformer]] = {
    "llama": LlamaModel,
    "qwen2": Qwen2Model,
    "gemma3": Gemma3Model,
}
#: The architectures echoline runs: exactly those with a model class.
SUPPORTED_ARCHITECTURES = tuple(MODEL_CLASSES)

__all__ = ["MODEL_CLASSES", "SUPPORTED_ARCHITECTURES", "Transformer"]
