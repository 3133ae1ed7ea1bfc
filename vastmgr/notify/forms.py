from datetime import timedelta

import apprise
from django import forms

from vastmgr.lib.errors import SecretUnavailable
from vastmgr.notify.models import Channel

# What a channel can subscribe to: the alerts' own kinds, then the Event kinds.
TOPICS = [
    ("host_offline", "host offline"), ("job_failed", "proof failed"),
    ("bad_benchmark", "bad benchmark"), ("instance_down", "Vast instance down"),
    ("unmanaged_instance", "unmanaged instance billing"), ("over_budget", "$/h over budget"),
    ("upstream_lie", "upstream daemon lying"), ("lifecycle", "lifecycle changes"),
    ("proof", "proof events"), ("ssh", "SSH"), ("vast", "Vast.ai"), ("fault", "faults"),
    ("bad_host", "bad hosts"), ("remote", "remote actions"), ("srs", "SRS preload/evict"),
    ("supervisor", "supervisor"),
]


class ChannelForm(forms.ModelForm):
    url = forms.CharField(
        max_length=2000, label="Apprise URL",
        widget=forms.PasswordInput(attrs={"autocomplete": "off"}),
        help_text="e.g. slack://…, discord://…, tgram://…, mailtos://…, json://host/path; "
                  "stored encrypted and never shown again")
    topics = forms.MultipleChoiceField(choices=TOPICS, required=False,
                                       widget=forms.CheckboxSelectMultiple,
                                       help_text="none ticked: every kind")
    resend_minutes = forms.IntegerField(min_value=1, max_value=7 * 24 * 60, initial=60,
                                        label="Resend the same alert after (minutes)")

    class Meta:
        model = Channel
        fields = ["name", "url", "min_level", "topics", "resend_minutes"]

    def clean_url(self) -> str:
        url = self.cleaned_data["url"].strip()
        if not apprise.Apprise().add(url):
            raise forms.ValidationError("apprise does not understand this URL (see its list of "
                                        "services for the form each one takes)")
        if same := self.channel_with_url(url):
            raise forms.ValidationError(f"this URL is already the channel {same.name}: change "
                                        "that channel's rules, or delete it first")
        return url

    @staticmethod
    def channel_with_url(url: str) -> Channel | None:
        """The channel that already sends to `url` (URLs are stored encrypted: each is read
        back; a channel whose URL cannot be read is not a match)."""
        for channel in Channel.objects.all():
            try:
                if channel.url().strip() == url:
                    return channel
            except SecretUnavailable:
                continue
        return None

    def save(self, commit: bool = True) -> Channel:
        channel = super().save(commit=False)
        channel.resend_after = timedelta(minutes=self.cleaned_data["resend_minutes"])
        channel.save()
        channel.set_url(self.cleaned_data["url"])
        return channel


