"""The client formats' edge: Bedrock InvokeModel and Vertex rawPredict routes (``routes.py``)
and the response that writes an answer in the client's format (``answer.py``)."""
