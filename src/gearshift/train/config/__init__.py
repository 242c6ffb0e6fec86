"""The job config: TOML sections mapped to dataclasses (`job`: JobConfig and the checks across sections; `model`
and `sections`: one dataclass per section, each checking its own keys; the settings a component reads are declared
by the component and embedded: models.config, comm.settings, cluster.emulate), `tables`: values onto keys and
`--section.key=value` overrides, `load`: a validated JobConfig from the defaults, a file and overrides."""

from gearshift.train.config.job import JobConfig, check_layers, check_ranges, validate
from gearshift.train.config.load import config_from_dict, load_config
from gearshift.train.config.model import BUILT_IN_MODELS, DATA_NAMES, MOE_KEYS, DataConfig, ModelConfig, given
from gearshift.train.config.sections import (
    PARTITIONS,
    SCHEDULES,
    STRATEGIES,
    UPDATES,
    AdaptConfig,
    ClusterConfig,
    MoEPlacementConfig,
    OutputConfig,
    ParallelConfig,
    TrainConfig,
    read_profile,
)
from gearshift.train.config.tables import check_override_spelling, parse_override

__all__ = [
    "BUILT_IN_MODELS", "DATA_NAMES", "MOE_KEYS", "PARTITIONS", "SCHEDULES", "STRATEGIES", "UPDATES", "AdaptConfig",
    "ClusterConfig", "DataConfig", "JobConfig", "ModelConfig", "MoEPlacementConfig", "OutputConfig",
    "ParallelConfig", "TrainConfig", "check_layers", "check_override_spelling", "check_ranges", "config_from_dict",
    "given", "load_config", "parse_override", "read_profile", "validate",
]
