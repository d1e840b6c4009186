"""An MCP server for squad's tests whose tools answer with content that is not text: an image,
audio, an embedded binary resource, an embedded text resource and a resource link.

    python tests/mcp_content_server.py
"""

import base64

import mcp_types as types
from mcp.server.mcpserver import MCPServer

server = MCPServer("content")
PNG = b"\x89PNG\r\n\x1a\n" + bytes(992)  # 1,000 bytes


@server.tool()
def picture() -> list[types.ContentBlock]:
    """A picture and a caption."""
    return [types.TextContent(type="text", text="a caption"),
            types.ImageContent(type="image", data=base64.b64encode(PNG).decode(), mime_type="image/png")]


@server.tool()
def sound() -> list[types.ContentBlock]:
    """A short sound."""
    return [types.AudioContent(type="audio", data=base64.b64encode(bytes(7)).decode(), mime_type="audio/wav")]


@server.tool()
def blob() -> list[types.ContentBlock]:
    """A binary file, embedded."""
    contents = types.BlobResourceContents(uri="file:///data/logo.png", mime_type="image/png",
                                          blob=base64.b64encode(PNG).decode())
    return [types.EmbeddedResource(type="resource", resource=contents)]


@server.tool()
def note() -> list[types.ContentBlock]:
    """A text file, embedded."""
    contents = types.TextResourceContents(uri="file:///notes/1.txt", mime_type="text/plain", text="buy tea")
    return [types.EmbeddedResource(type="resource", resource=contents)]


@server.tool()
def link() -> list[types.ContentBlock]:
    """A link to a file, not its content."""
    return [types.ResourceLink(type="resource_link", uri="file:///reports/q3.pdf", name="q3.pdf",
                               mime_type="application/pdf", size=48213)]


if __name__ == "__main__":
    server.run()
