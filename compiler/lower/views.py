"""Views: placeholder until the view lowering lands."""
