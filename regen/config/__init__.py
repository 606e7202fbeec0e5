"""`RegenConfig`: the one configuration model, loaded from YAML and used as the flow's parameter.

Every section forbids unknown keys, so a typo is an error that names its dotted path instead
of a silently ignored setting discovered after the GPUs are rented. Each section has its own
module here, the audit's thresholds and the export's options included; the package imports
only pydantic, yaml and `regen.errors`, so every layer may import it.
"""

from regen.config.audit import AuditConfig, RowCheck, Threshold
from regen.config.engine import (
    CPU_KV_CACHE_TOKENS,
    BenchConfig,
    EmulatorConfig,
    EngineConfig,
    Port,
    RelaunchConfig,
    SpeculativeConfig,
)
from regen.config.export import (
    FORMATS,
    TOKEN_FORMATS,
    ExportConfig,
    ExportFormat,
    ExportOptions,
    Turns,
)
from regen.config.features import Convention, FeatureDtype, FeaturesConfig
from regen.config.generation import GenerationConfig
from regen.config.input import InputConfig
from regen.config.load import (
    format_validation_error,
    load_config,
    parse_config,
    read_config_data,
    set_dotted,
)
from regen.config.model import ModelConfig
from regen.config.publish import PublishConfig
from regen.config.sampling import (
    ReasoningEffort,
    RegenerationConfig,
    SamplingConfig,
    SamplingSetting,
    check_shares,
)
from regen.config.settings import RegenConfig

__all__ = [
    "CPU_KV_CACHE_TOKENS",
    "FORMATS",
    "TOKEN_FORMATS",
    "AuditConfig",
    "BenchConfig",
    "Convention",
    "EmulatorConfig",
    "EngineConfig",
    "ExportConfig",
    "ExportFormat",
    "ExportOptions",
    "FeatureDtype",
    "FeaturesConfig",
    "GenerationConfig",
    "InputConfig",
    "ModelConfig",
    "Port",
    "PublishConfig",
    "ReasoningEffort",
    "RegenConfig",
    "RegenerationConfig",
    "RelaunchConfig",
    "RowCheck",
    "SamplingConfig",
    "SamplingSetting",
    "SpeculativeConfig",
    "Threshold",
    "Turns",
    "check_shares",
    "format_validation_error",
    "load_config",
    "parse_config",
    "read_config_data",
    "set_dotted",
]
