from django.urls import path

from vastmgr.notify import views

app_name = "notify"
urlpatterns = [
    path("", views.channels, name="channels"),
    path("<int:pk>/test/", views.test_channel, name="test"),
    path("<int:pk>/delete/", views.delete_channel, name="delete"),
]
