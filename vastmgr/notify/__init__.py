"""Notifications: Events that matter go to the channels operators read (Slack, Discord,
Telegram, email, webhooks ... through apprise), with per-channel rules, de-duplication, a
resend interval and retries with backoff. Delivery runs in its own process (`run_notifier`)."""
