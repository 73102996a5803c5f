"""Expert parallelism: a mixture-of-experts layer, its experts spread over the ranks.

    router     which k experts a token goes to and its gates: softmax or sigmoid scores,
               Switch's un-normalised k = 1 gate or renormalised top-k, DeepSeek-V3's bias and
               node-limited choice, float32 scores; the Switch loss, the z-loss, expert choice
    moe        the experts and the layer on one process: the serial twin of all that follows;
               parameters and FLOPs against a dense layer
    capacity   a capacity per source and expert, decided on the sending rank (drop policies)
    dispatch   expert parallelism by hand: count exchange, all-to-all with uneven splits and
               its reverse, autograd through both, weighting at home or at the expert; the
               gradients of EP inside DP
    padded     the capacity dispatcher with static shapes: no count exchange, no host sync
    grouped    the received rows regrouped by expert, one grouped GEMM
    balance    short training runs that measure the balance and the drops
    imbalance  the layer timed part by part on real ranks, at a router skew, and its peak memory
    ep_cost    bytes per layer (EP, TP, all-gather dispatcher), memory per rank, routing draws

Notebook 10 teaches them; lab 8 asks a learner for its own router_topk, dispatch, combine and
switch_aux_loss (its grading.toml refuses this package).
"""
