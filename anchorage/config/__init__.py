"""Anchorage's configuration document (``anchorage.yaml``): typed, rendered and parsed here
for the operator (which writes it), the vLLM plugin, the node-agent sidecar and the router
(which read it). ``document`` holds the sections and the rules, ``parameters`` the one
table of policy parameter names."""

from anchorage.config.document import (DATA_KEY, GENERATION_ANNOTATION, ConfigDocument,  # noqa: F401
                                       PolicySection, RoutingSection, Source, Target,
                                       configmap_name, parse, read, render, scorer_names)
from anchorage.config.parameters import (PARAMETERS, TUNABLE, ConfigError,  # noqa: F401
                                         Parameter, PolicyParameters)
