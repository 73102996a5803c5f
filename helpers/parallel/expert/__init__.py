"""Expert parallelism: a mixture-of-experts layer, its experts spread over the ranks.

The layer on one process, the serial twin of everything after it (moe: the router's top-k
with its weights renormalised over the k chosen, the experts, the weighted combine, the
capacity that drops tokens, the Switch auxiliary loss and DeepSeek-V3's auxiliary-loss-free
bias, parameters and FLOPs against a dense layer), short training runs that measure the
balance and the drops (balance), expert parallelism by hand (dispatch: the count exchange,
the permutation by expert, the all-to-all with uneven splits and its reverse, autograd
through both, the combine on the token's home rank; the gradients of EP inside DP), and
what it costs (ep_cost: bytes per layer against tensor parallelism's all-reduces, memory per
rank, the load and drops of a routing draw). Notebook 10 teaches them; the functions a
lab asks a learner for (router_topk, dispatch, combine, switch_aux_loss) are each one
function here.
"""
