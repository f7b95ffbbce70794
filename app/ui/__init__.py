"""Layout and formats every page shares: the menu of pages, the screen layout, the figures' style, numbers as people read them, the hardware pickers. Imports nothing else of app/."""
