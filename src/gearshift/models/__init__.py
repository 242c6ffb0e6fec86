"""gearshift.models: LayeredModel (ordered layers + loss) and the GPT built from it."""

from gearshift.models.gpt import GPTConfig, build_gpt
from gearshift.models.layered import LayeredModel

__all__ = ["GPTConfig", "LayeredModel", "build_gpt"]
