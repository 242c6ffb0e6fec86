"""gearshift.profile: per-layer model profiles (ModelProfile) and the profiler that measures them."""

from gearshift.profile.model_profile import LayerProfile, ModelProfile
from gearshift.profile.profiler import print_profile, profile_model

__all__ = ["LayerProfile", "ModelProfile", "print_profile", "profile_model"]
