"""The web layer: the service's HTTP surface. Handlers of the REST API (each declares the scope
it needs, web/scopes.py), request and answer models (schemas.py) and the OpenAPI document built
from both, authentication, the dashboard and the hub's home-page notices. It may import every
layer below it (runtime, domain, store).
"""
