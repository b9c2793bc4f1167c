"""The layout contract: perms (perms.py), what each handler asks of them (policies.py), the
plan that gives every value a perm (plan.py), what a plan costs and the search that lowers
it (cost.py), and where each transpose of a conversion comes from (explain.py). A pure
function of the graph: imports the ir layer only, never TensorFlow."""
