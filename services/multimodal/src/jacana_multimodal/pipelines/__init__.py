"""Video models behind one interface (``base.VideoModel``) and the registry that builds them
from settings (``registry``).

- ``base``: the interface, the card and the render request.
- ``cards``: each architecture's static card (pure data; the service imports only this side).
- ``registry``: model specs from settings, architecture name -> card and loader.
- ``wan``: Wan 2.1 text-to-video and image-to-video over diffusers (render workers only).
- ``tiny_wan``: the embedded random-weight Wan models, built into a cache on first use.
"""
