"""The fusion kinds the Converter applies, each behind fusions.contract's Fusion.

FUSIONS is the one registry: the Converter finds, sizes, splices and reports the
kinds in its order (a kind's matches are spliced before the next kind's, and a
later kind's match may read an earlier one's output).
"""

from tf_dietcode.graph_rewrite.fusions.attention import Attention
from tf_dietcode.graph_rewrite.fusions.contract import Fusion
from tf_dietcode.graph_rewrite.fusions.dense import Dense
from tf_dietcode.graph_rewrite.fusions.layer_norm import LayerNorm
from tf_dietcode.graph_rewrite.fusions.softmax import Softmax

FUSIONS: list[Fusion] = [Dense(), Attention(), LayerNorm(), Softmax()]
