"""`vitpose.hub`: published weights by name (`list_models`, `lookup`, `download`, `download_hf`, ...).

The public path of `vitpose.models.hub`, which holds the code (beside the model spec and the
weight readers). Importing this module gives that module itself, so `import vitpose.hub`,
`from vitpose.hub import download` and `vitpose.hub.download` are one object with one state:
a name has one public path, and patching `vitpose.hub.X` patches what `vitpose.load_model` calls.
"""

import sys

from vitpose.models import hub

sys.modules[__name__] = hub
