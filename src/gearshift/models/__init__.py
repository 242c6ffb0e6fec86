"""gearshift.models: LayeredModel (ordered layers + loss), ModelSpec (a model built layer by layer) and the
GPT built from them."""

from gearshift.models import moe as _moe  # noqa: F401  (the built-in models register: gpt, moe_gpt)
from gearshift.models.gpt import GPTConfig, build_gpt
from gearshift.models.layered import LayeredModel
from gearshift.models.spec import ModelSpec

__all__ = ["GPTConfig", "LayeredModel", "ModelSpec", "build_gpt"]
