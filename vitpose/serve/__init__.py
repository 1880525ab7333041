"""`vitpose serve`: poses over HTTP (`app.py`), request batching (`batching.py`), Label Studio's ML
backend protocol (`labelstudio.py`), uvicorn (`server.py`) and the page (`page/index.html`).

Needs the `serve` extra (`pip install "vitpose[serve]"`: Starlette, uvicorn, python-multipart);
importing `vitpose.serve` alone imports none of them.
"""
