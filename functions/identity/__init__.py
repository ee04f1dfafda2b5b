"""Who is calling: principals, their roles, and the credentials that name them.

`principal` is the model every door shares; `keys`, `oidc` and `iam` turn a
credential into a principal; `authenticate` picks among them for a request.
"""
