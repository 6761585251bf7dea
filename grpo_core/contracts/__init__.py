"""The seams every other layer meets at, importing nothing of ours: the rollout engine and
sampler protocols (`rollout`), the train engine protocol and optimizer settings (`training`),
the padded policy batch (`policy_batch`), finiteness guards (`numerics`), the one user-error
base class (`errors`) and the registry of extension points (`registry`)."""
