"""WebSocket consumers: each joins a group and forwards rendered HTML fragments to the browser."""

from channels.generic.websocket import AsyncWebsocketConsumer

# Close code for "not logged in": the 4000 range is free for applications; 4403 mirrors HTTP 403.
CLOSE_FORBIDDEN = 4403


class FragmentConsumer(AsyncWebsocketConsumer):
    """Joins one channel-layer group and relays `fragment` messages (htmx OOB swaps)."""

    group = ""

    def get_group(self) -> str:
        return self.group

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.group = self.get_group()
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        if self.group and self.channel_layer is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def fragment(self, event):
        await self.send(text_data=event["html"])


class FleetConsumer(FragmentConsumer):
    group = "fleet"
